//! Helpers for the end-to-end tests: finding the built binaries, compiling the CUDA test
//! programs with nvcc, running them through `phosctl run`, and a raw guest connection for
//! tests that speak the protocol directly.
//!
//! The tests use the binaries of the same build (`target/<profile>/phosctl`,
//! `phos-api-server`, `libphos_guest.so`); `make test` builds them before running the tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use phos_protocol::frame::{FrameHeader, FrameKind};
use phos_protocol::handshake::{Hello, Welcome};
use phos_protocol::transport::{Transport, TransportError, UnixTransport};
use phos_router::{Router, RouterConfig};

/// `target/<profile>`, where cargo put this test's binaries.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    // target/<profile>/deps/<test>-<hash>
    exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf()
}

/// A binary or library of this build; panics with what to do when it is missing.
pub fn built(name: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(p.exists(), "{} is missing: build the workspace first (`make test` does)", p.display());
    p
}

/// The CUDA test programs' sources.
pub fn cuda_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda")
}

/// nvcc, if this machine has it. Where `PHOS_REQUIRE_NVCC=1` (CI), its absence fails the test.
pub fn nvcc() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("nvcc")).find(|p| p.exists()));
    if found.is_none() {
        assert!(
            std::env::var("PHOS_REQUIRE_NVCC").as_deref() != Ok("1"),
            "nvcc is required (PHOS_REQUIRE_NVCC=1) but not on PATH"
        );
        eprintln!("nvcc not found: skipping tests that build CUDA programs");
    }
    found
}

/// The shipped policy `name`'s object. A build made with `PHOS_WITHOUT_POLICIES=1` has none:
/// the test is then skipped, unless `PHOS_REQUIRE_CLANG=1` (CI) makes their absence fail it.
pub fn shipped_policy(name: &str) -> Option<&'static [u8]> {
    if let Some(absent) = phos_policy::shipped::absent() {
        assert!(
            std::env::var("PHOS_REQUIRE_CLANG").as_deref() != Ok("1"),
            "the shipped policies are required (PHOS_REQUIRE_CLANG=1): {absent}"
        );
        eprintln!("skipping: {absent}");
        return None;
    }
    let found = phos_policy::shipped::get(name);
    assert!(found.is_some(), "no shipped policy {name}; there are {:?}", phos_policy::shipped::NAMES);
    found
}

/// Compile the C policy `tests/policies/<name>.c` with clang, if this machine has clang.
pub fn build_policy(name: &str) -> Option<Vec<u8>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies").join(format!("{name}.c"));
    let out_dir = target_dir().join("test-policies");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join(format!("{name}.o"));
    match phos_policy::build(&src, &out, "clang") {
        Ok(()) => Some(std::fs::read(&out).unwrap()),
        Err(e) => {
            assert!(std::env::var("PHOS_REQUIRE_CLANG").as_deref() != Ok("1"), "building {name}: {e}");
            eprintln!("cannot build test policy {name} ({e}): skipping");
            None
        }
    }
}

/// The programs of tests/hostile: CUDA programs that misbehave on purpose, whose output the
/// tests that run them check themselves (no native run to compare with).
pub fn hostile_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hostile")
}

/// What the routers of this test binary have logged so far (they run in this process: the
/// first call starts collecting, at `info`).
pub fn router_log() -> String {
    use std::sync::{Mutex, Once};
    static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());
    static START: Once = Once::new();
    struct Collect;
    impl std::io::Write for Collect {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            LOG.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    START.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(|| Collect)
            .try_init();
    });
    String::from_utf8_lossy(&LOG.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

/// Compile `tests/cuda/<name>.cu` into the build's cache directory (once per source change).
pub fn build_program(nvcc: &Path, name: &str, extra: &[&str]) -> PathBuf {
    build_program_from(nvcc, &cuda_dir(), name, extra)
}

/// [`build_program`] for `<dir>/<name>.cu` (the benchmark programs of tests/bench).
pub fn build_program_from(nvcc: &Path, dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    build_with_runtime(nvcc, dir, name, "shared", extra)
}

/// [`build_program`] with NVIDIA's CUDA runtime linked into the program (`-cudart static`,
/// nvcc's default), which Phos cannot serve.
pub fn build_static_program(nvcc: &Path, name: &str, extra: &[&str]) -> PathBuf {
    build_with_runtime(nvcc, &cuda_dir(), name, "static", extra)
}

fn build_with_runtime(nvcc: &Path, dir: &Path, name: &str, cudart: &str, extra: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.cu"));
    let tag = if extra.is_empty() {
        String::new()
    } else {
        format!("-{}", extra.join("").replace(['/', ' ', '=', ','], "_"))
    };
    let tag = if cudart == "shared" { tag } else { format!("{tag}-cudart-{cudart}") };
    let out_dir = target_dir().join("cuda-programs");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(format!("{name}{tag}"));
    let newer = |a: &Path, b: &Path| {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((m(a), m(b)), (Some(x), Some(y)) if x >= y)
    };
    // Tests of one binary that build the same program wait for each other; the result is
    // renamed into place, so another test binary never runs a half-written file.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let headers = ["check.h", "driver_check.h"].map(|h| cuda_dir().join(h));
    if exe.exists() && newer(&exe, &src) && headers.iter().all(|h| newer(&exe, h)) {
        return exe;
    }
    let partial = out_dir.join(format!(".{name}{tag}.{}", std::process::id()));
    let out = Command::new(nvcc)
        .args(["-cudart", cudart, "-O2", "-I"])
        .arg(cuda_dir())
        .args(extra)
        .arg("-o")
        .arg(&partial)
        .arg(&src)
        .output()
        .expect("running nvcc");
    assert!(out.status.success(), "nvcc {name}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&partial, &exe).unwrap();
    exe
}

/// Link flags for a program that calls cuDNN 9 where NVIDIA's libcudnn is absent (CI): a stub
/// `libcudnn.so` built here whose soname is `libcudnn.so.9` and which defines the functions
/// tests/cuda/cudnn_conv.cu, cudnn_batchnorm.cu, cudnn_mnist_layers.cu and cudnn_mnist_full.cu call, so the programs are linked as against
/// NVIDIA's library (they need `libcudnn.so.9`, which Phos's guest directory serves when they
/// run).
pub fn cudnn_link_flags() -> [String; 2] {
    const FUNCTIONS: [&str; 109] = [
        "cudnnCreate",
        "cudnnDestroy",
        "cudnnSetStream",
        "cudnnGetStream",
        "cudnnGetVersion",
        "cudnnGetErrorString",
        "cudnnGetLastErrorString",
        "cudnnBackendCreateDescriptor",
        "cudnnBackendDestroyDescriptor",
        "cudnnBackendFinalize",
        "cudnnBackendSetAttribute",
        "cudnnBackendGetAttribute",
        "cudnnBackendExecute",
        "cudnnCreateTensorDescriptor",
        "cudnnDestroyTensorDescriptor",
        "cudnnSetTensor4dDescriptor",
        "cudnnSetTensor4dDescriptorEx",
        "cudnnSetTensorNdDescriptor",
        "cudnnSetTensorNdDescriptorEx",
        "cudnnGetTensor4dDescriptor",
        "cudnnGetTensorNdDescriptor",
        "cudnnGetTensorSizeInBytes",
        "cudnnDeriveBNTensorDescriptor",
        "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
        "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
        "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
        "cudnnBatchNormalizationForwardTraining",
        "cudnnBatchNormalizationForwardTrainingEx",
        "cudnnBatchNormalizationForwardInference",
        "cudnnBatchNormalizationBackward",
        "cudnnBatchNormalizationBackwardEx",
        "cudnnCreateFilterDescriptor",
        "cudnnCreateRNNDescriptor",
        "cudnnDestroyFilterDescriptor",
        "cudnnSetFilter4dDescriptor",
        "cudnnSetFilterNdDescriptor",
        "cudnnGetFilter4dDescriptor",
        "cudnnGetFilterNdDescriptor",
        "cudnnGetFilterSizeInBytes",
        "cudnnCreateConvolutionDescriptor",
        "cudnnDestroyConvolutionDescriptor",
        "cudnnSetConvolution2dDescriptor",
        "cudnnSetConvolutionNdDescriptor",
        "cudnnGetConvolution2dDescriptor",
        "cudnnGetConvolutionNdDescriptor",
        "cudnnSetConvolutionMathType",
        "cudnnGetConvolutionMathType",
        "cudnnSetConvolutionGroupCount",
        "cudnnGetConvolutionGroupCount",
        "cudnnGetConvolution2dForwardOutputDim",
        "cudnnGetConvolutionNdForwardOutputDim",
        "cudnnGetConvolutionForwardAlgorithmMaxCount",
        "cudnnGetConvolutionBackwardDataAlgorithmMaxCount",
        "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount",
        "cudnnGetConvolutionForwardAlgorithm_v7",
        "cudnnFindConvolutionForwardAlgorithm",
        "cudnnFindConvolutionForwardAlgorithmEx",
        "cudnnGetConvolutionBackwardDataAlgorithm_v7",
        "cudnnFindConvolutionBackwardDataAlgorithmEx",
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
        "cudnnFindConvolutionBackwardFilterAlgorithm",
        "cudnnGetConvolutionForwardWorkspaceSize",
        "cudnnGetConvolutionBackwardDataWorkspaceSize",
        "cudnnGetConvolutionBackwardFilterWorkspaceSize",
        "cudnnConvolutionForward",
        "cudnnConvolutionBackwardData",
        "cudnnConvolutionBackwardFilter",
        "cudnnConvolutionBackwardBias",
        "cudnnConvolutionBiasActivationForward",
        "cudnnCreateActivationDescriptor",
        "cudnnDestroyActivationDescriptor",
        "cudnnSetActivationDescriptor",
        "cudnnGetActivationDescriptor",
        "cudnnActivationForward",
        "cudnnActivationBackward",
        "cudnnAddTensor",
        "cudnnSetTensor",
        "cudnnScaleTensor",
        "cudnnTransformTensor",
        "cudnnCreateOpTensorDescriptor",
        "cudnnDestroyOpTensorDescriptor",
        "cudnnSetOpTensorDescriptor",
        "cudnnGetOpTensorDescriptor",
        "cudnnOpTensor",
        "cudnnCreatePoolingDescriptor",
        "cudnnDestroyPoolingDescriptor",
        "cudnnSetPooling2dDescriptor",
        "cudnnGetPooling2dDescriptor",
        "cudnnSetPoolingNdDescriptor",
        "cudnnGetPoolingNdDescriptor",
        "cudnnGetPooling2dForwardOutputDim",
        "cudnnGetPoolingNdForwardOutputDim",
        "cudnnPoolingForward",
        "cudnnPoolingBackward",
        "cudnnSoftmaxForward",
        "cudnnSoftmaxBackward",
        "cudnnCreateLRNDescriptor",
        "cudnnDestroyLRNDescriptor",
        "cudnnSetLRNDescriptor",
        "cudnnGetLRNDescriptor",
        "cudnnLRNCrossChannelForward",
        "cudnnLRNCrossChannelBackward",
        "cudnnCreateReduceTensorDescriptor",
        "cudnnDestroyReduceTensorDescriptor",
        "cudnnSetReduceTensorDescriptor",
        "cudnnGetReduceTensorDescriptor",
        "cudnnGetReductionIndicesSize",
        "cudnnGetReductionWorkspaceSize",
        "cudnnReduceTensor",
    ];
    let dir = target_dir().join("cudnn-link-stub");
    let lib = dir.join("libcudnn.so");
    let src = dir.join("stub.c");
    let body: String = FUNCTIONS.iter().map(|f| format!("void {f}(void) {{}}\n")).collect();
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    // Built again when the list changed.
    if !lib.exists() || std::fs::read_to_string(&src).ok().as_deref() != Some(body.as_str()) {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&src, &body).unwrap();
        let partial = dir.join(format!(".libcudnn.so.{}", std::process::id()));
        cc(&["-shared", "-fPIC", "-Wl,-soname,libcudnn.so.9", "-o"]
            .map(std::ffi::OsStr::new)
            .into_iter()
            .chain([partial.as_os_str(), src.as_os_str()])
            .collect::<Vec<_>>());
        std::fs::rename(&partial, &lib).unwrap();
    }
    [format!("-L{}", dir.display()), "-lcudnn".to_string()]
}

/// Run the C compiler (`cc`) with `args`; panics with its messages if it fails.
pub fn cc(args: &[&std::ffi::OsStr]) {
    let out = Command::new("cc").args(args).output().expect("running cc (a C compiler is part of the set-up)");
    assert!(out.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Run a program through `phosctl run --backend <backend>` (on the default transport:
/// shared memory).
pub fn phos_run(backend: &str, program: &Path, args: &[&str]) -> Output {
    phos_run_over(backend, "auto", program, args)
}

/// [`phos_run`] with `--transport <transport>`.
pub fn phos_run_over(backend: &str, transport: &str, program: &Path, args: &[&str]) -> Output {
    Command::new(built("phosctl"))
        .args(["run", "--backend", backend, "--transport", transport, "--"])
        .arg(program)
        .args(args)
        .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
        .output()
        .expect("running phosctl")
}

/// A router running in this process with its own socket, and its API servers' logs.
pub struct TestRouter {
    pub router: Arc<Router>,
    pub dir: tempfile::TempDir,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestRouter {
    pub fn start(backend: &str) -> Self {
        Self::start_with(backend, |_| {})
    }

    /// A router whose configuration `adjust` changes first (a pool, ...).
    pub fn start_with(backend: &str, adjust: impl FnOnce(&mut RouterConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = RouterConfig::new(
            dir.path().join("router.sock"),
            dir.path().join("servers"),
            built("phos-api-server"),
            vec!["--backend".into(), backend.into(), "--emu-memory".into(), (1u64 << 30).to_string()],
        );
        config.max_payload = 64 << 20;
        config.linger = Duration::from_secs(5);
        config.server_log_dir = Some(dir.path().join("logs"));
        config.reconnect_wait = Duration::from_secs(60);
        adjust(&mut config);
        let router = Router::new(config).expect("a valid router configuration");
        let listener = router.bind().unwrap();
        let r = router.clone();
        let thread = Some(std::thread::spawn(move || r.serve(listener).expect("the test router serves until stopped")));
        // `serve` starts the management service on a thread of its own: a `phosctl` command
        // of the test must find it listening.
        let ctl = phos_control::control_path(&dir.path().join("router.sock"));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
            assert!(std::time::Instant::now() < deadline, "the router's management service did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        TestRouter { router, dir, thread }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("router.sock")
    }

    /// `phosctl ARGS --router unix:{socket}`.
    pub fn phosctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(built("phosctl"))
            .args(args)
            .arg("--router")
            .arg(format!("unix:{}", self.socket().display()))
            .output()
            .expect("running phosctl")
    }

    /// Everything the API servers have logged so far.
    pub fn server_logs(&self) -> String {
        let mut all = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path().join("logs")) {
            for e in entries.flatten() {
                all.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        all
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        self.router.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A guest channel speaking the protocol by hand (on the socket, or on shared memory).
pub struct RawGuest<T: Transport = UnixTransport> {
    pub transport: T,
    pub welcome: Welcome,
    next_call: u64,
}

/// A reply: status and payload.
pub struct RawReply {
    pub status: i32,
    pub payload: Vec<u8>,
}

/// Send a test guest's Hello on `socket` (the pinned arena after it, if any) and read the
/// answer: the Welcome, or the refusal's text.
fn handshake(
    socket: &std::os::unix::net::UnixStream,
    token: Option<[u8; 16]>,
    transports: Vec<phos_protocol::handshake::TransportKind>,
    arena: Option<&std::os::fd::OwnedFd>,
) -> Result<Welcome, String> {
    let mut transport = UnixTransport::new(socket.try_clone().map_err(|e| e.to_string())?);
    let hello = Hello {
        apis: phos_protocol::handshake::ApiVersion::of_this_build(),
        pid: std::process::id(),
        abi_major: 12,
        token,
        program: "hostile-guest-test".into(),
        transports,
        tenant_token: None,
        host_arena: arena.map(|fd| phos_protocol::host_arena::checked_len(fd).unwrap_or(0)),
    };
    let payload = phos_protocol::encode(&hello);
    let mut h = FrameHeader::new(FrameKind::Hello);
    h.version = phos_protocol::frame::HANDSHAKE_VERSION;
    h.payload_len = payload.len() as u64;
    transport.send(&h, &[&payload]).map_err(|e| e.to_string())?;
    if let Some(fd) = arena {
        phos_protocol::shm::send_fd(socket, fd).map_err(|e| e.to_string())?;
    }
    let mut buf = Vec::new();
    let rh = transport.recv(&mut buf).map_err(|e| e.to_string())?;
    match rh.kind {
        FrameKind::Welcome => phos_protocol::decode(&buf).map_err(|e| e.to_string()),
        FrameKind::Refused => Err(String::from_utf8_lossy(&buf).into_owned()),
        k => Err(format!("unexpected {k:?}")),
    }
}

impl RawGuest<phos_protocol::shm::ShmTransport> {
    /// Open a channel on shared memory, sending `arena` as the process's pinned arena: a new
    /// session, or one joining `token`'s.
    pub fn connect_shm(
        socket: &Path,
        token: Option<[u8; 16]>,
        arena: Option<&std::os::fd::OwnedFd>,
    ) -> Result<Self, String> {
        use phos_protocol::handshake::TransportKind;
        let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|e| e.to_string())?;
        let welcome = handshake(&stream, token, vec![TransportKind::Shm], arena)?;
        if welcome.transport != TransportKind::Shm {
            return Err(format!("the router answered {:?}", welcome.transport));
        }
        let (transport, _) = phos_protocol::shm::ShmTransport::attach(stream, 1 << 30).map_err(|e| e.to_string())?;
        Ok(RawGuest { transport, welcome, next_call: 1 })
    }
}

impl RawGuest {
    /// Open a channel: a new session, or one joining `token`'s.
    pub fn connect(socket: &Path, token: Option<[u8; 16]>) -> Result<Self, String> {
        let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|e| e.to_string())?;
        let welcome = handshake(&stream, token, Vec::new(), None)?;
        Ok(RawGuest { transport: UnixTransport::new(stream), welcome, next_call: 1 })
    }
}

impl<T: Transport> RawGuest<T> {
    /// Send a call of the runtime API with an arbitrary function id and payload; wait for the
    /// reply.
    pub fn call_raw(&mut self, function: u32, session: u64, payload: &[u8]) -> Result<RawReply, TransportError> {
        self.call_raw_api(0, function, session, payload)
    }

    /// Send a call with an arbitrary API id, function id and payload; wait for the reply.
    pub fn call_raw_api(
        &mut self,
        api: u16,
        function: u32,
        session: u64,
        payload: &[u8],
    ) -> Result<RawReply, TransportError> {
        let mut h = FrameHeader::new(FrameKind::Call);
        h.api = api;
        h.function = function;
        h.session = session;
        h.call_id = self.next_call;
        h.payload_len = payload.len() as u64;
        self.next_call += 1;
        self.transport.send(&h, &[payload])?;
        let mut buf = Vec::new();
        let rh = self.transport.recv(&mut buf)?;
        assert_eq!(rh.kind, FrameKind::Reply, "reply frame ({:?})", String::from_utf8_lossy(&buf));
        assert_eq!(rh.call_id, h.call_id);
        Ok(RawReply { status: rh.status, payload: buf })
    }

    /// Send a synchronous call of the spec with the call id and flags given (as a guest
    /// library sends a call again after a lost connection), without waiting for its reply.
    pub fn send_as<R: phos_protocol::RemoteCall>(&mut self, req: &R, call_id: u64, flags: u16) -> std::io::Result<()> {
        let payload = phos_protocol::encode(req);
        let mut h = FrameHeader::new(FrameKind::Call);
        h.api = R::FUNCTION.api().id();
        h.function = R::FUNCTION.id();
        h.session = self.welcome.session;
        h.call_id = call_id;
        h.flags = flags;
        h.payload_len = payload.len() as u64;
        self.transport.send(&h, &[&payload])
    }

    /// Wait for the reply to synchronous call `call_id` of `R` (acknowledgements and device
    /// output before it are skipped).
    pub fn reply_to<R: phos_protocol::RemoteCall>(&mut self, call_id: u64) -> Result<R::Reply, i32> {
        let mut buf = Vec::new();
        loop {
            let rh = self.transport.recv(&mut buf).expect("transport");
            if rh.kind == FrameKind::Output || rh.flags & phos_protocol::frame::FLAG_ASYNC != 0 {
                continue;
            }
            assert_eq!((rh.kind, rh.call_id), (FrameKind::Reply, call_id), "the reply");
            if rh.status != 0 {
                return Err(rh.status);
            }
            return Ok(phos_protocol::decode(&buf).expect("reply decodes"));
        }
    }

    /// Send a well-formed request of the spec.
    pub fn call<R: phos_protocol::RemoteCall>(&mut self, req: &R) -> Result<R::Reply, i32> {
        let payload = phos_protocol::encode(req);
        let session = self.welcome.session;
        let r = self.call_raw_api(R::FUNCTION.api().id(), R::FUNCTION.id(), session, &payload).expect("transport");
        if r.status != 0 {
            return Err(r.status);
        }
        Ok(phos_protocol::decode(&r.payload).expect("reply decodes"))
    }
}

/// A router in a process of its own (`phosctl serve --config`), for tests that limit its
/// resources (descriptors, threads), run it as another user, or watch its log and CPU time.
/// Its configuration gets `{dir}` replaced by its private directory; the main socket is
/// `{dir}/router.sock`, API server logs go to `{dir}/logs`.
pub struct ChildRouter {
    pub dir: tempfile::TempDir,
    pub child: std::process::Child,
}

impl ChildRouter {
    /// Start `phosctl serve --backend emu` with `config` (TOML, after `listen`), `prepare`
    /// running in the child before it executes (limits, another user), and wait until
    /// every socket the configuration names is listening.
    pub fn start(config: &str, prepare: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static) -> Self {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        // Open to another user the router may run as.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let d = dir.path().display().to_string();
        let text = format!("listen = \"{d}/router.sock\"\n{}", config.replace("{dir}", &d));
        std::fs::write(dir.path().join("router.toml"), &text).unwrap();
        let log = std::fs::File::create(dir.path().join("router.log")).unwrap();
        std::fs::set_permissions(dir.path().join("router.log"), std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut cmd = Command::new(built("phosctl"));
        cmd.args(["serve", "--backend", "emu", "--emu-memory", &(256u64 << 20).to_string(), "--config"])
            .arg(dir.path().join("router.toml"))
            .env("PHOS_SERVER_LOG_DIR", dir.path().join("logs"))
            .env("PHOS_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        // SAFETY: `prepare` runs in the forked child before exec; the tests' closures only
        // make system calls (setrlimit, setuid), which are async-signal-safe.
        unsafe { cmd.pre_exec(prepare) };
        let child = cmd.spawn().expect("starting phosctl serve");
        let mut r = ChildRouter { dir, child };
        let sockets: Vec<PathBuf> = std::iter::once(r.socket())
            .chain(text.lines().filter_map(|l| {
                let v = l.trim().strip_prefix("socket")?.split('"').nth(1)?;
                Some(PathBuf::from(v))
            }))
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !(r.log().contains("router listening") && sockets.iter().all(|s| s.exists())) {
            assert!(r.alive(), "the router exited at start: {}", r.log());
            assert!(std::time::Instant::now() < deadline, "the router did not start: {}", r.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        // The tenant sockets are bound before the accept loops start; give them a moment.
        std::thread::sleep(Duration::from_millis(100));
        r
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("router.sock")
    }

    /// `{dir}/NAME.sock`, a tenant socket of the configuration.
    pub fn tenant_socket(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.sock"))
    }

    /// What the router has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("router.log")).unwrap_or_default()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// User and system CPU time the router has used.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // Fields after the command name (which may hold spaces) start at state, field 3;
        // utime and stime are fields 14 and 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
        // SAFETY: sysconf has no memory effects.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        f.get(11).zip(f.get(12)).map_or(0.0, |(u, s)| (u + s) as f64 / ticks)
    }

    /// The router's resident memory, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib << 10)
    }

    /// The router's threads now.
    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.child.id())).map_or(0, |d| d.count())
    }

    /// Run `exe` through the router socket `socket` (`phosctl run --endpoint`).
    pub fn run(&self, socket: &Path, exe: &Path) -> Output {
        Command::new(built("phosctl"))
            .args(["run", "--endpoint"])
            .arg(format!("unix:{}", socket.display()))
            .arg("--")
            .arg(exe)
            .env("PHOS_GUEST_LIB", built("libphos_guest.so"))
            .output()
            .expect("running phosctl")
    }

    /// `phosctl ARGS --router unix:{dir}/router.sock`.
    pub fn phosctl(&self, args: &[&str]) -> Output {
        Command::new(built("phosctl"))
            .args(args)
            .arg("--router")
            .arg(format!("unix:{}", self.socket().display()))
            .output()
            .expect("running phosctl")
    }
}

impl Drop for ChildRouter {
    fn drop(&mut self) {
        // SAFETY: kill has no memory effects; the pid is our child's, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
